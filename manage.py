#!/usr/bin/env python
"""Django's command-line utility; `llamaswap` on PATH is the same thing."""

from llamaswap_site.manage import main

if __name__ == "__main__":
    main()
