"""The operators' admin, found by Django as `scheduling.admin`: importing the package registers every page.

`site`: the admin's look, the live queue, the models, the scheduler settings and the request history;
`batches`, `leases`, `keys`: the Batches, Leases and API keys pages; `read_only`: the base of a page that only shows rows; `forms`: the pages' fields, checked as the
config file checks its values; `not_found` and `login_lockout`: the admin's answers to an address that leads
nowhere and to a login refused after too many wrong passwords.
"""

from . import batches, keys, leases, site  # noqa: F401  (each registers its pages)
