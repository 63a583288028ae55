"""`llamaswap fakemodel --port N …`: the shipped stand-in model server (see proxy/fakemodel.py)."""

from django.core.management.base import BaseCommand

from proxy import fakemodel


class Command(BaseCommand):
    help = "Run the fake OpenAI-compatible model server used by the demo, the tests and the benchmarks."

    def run_from_argv(self, argv):
        # Every option belongs to the fake server; Django's own options do not apply.
        raise SystemExit(fakemodel.main(argv[2:]))
