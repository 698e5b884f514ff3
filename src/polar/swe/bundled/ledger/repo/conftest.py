# Puts the repository root on sys.path, so the tests import ledger from this checkout.
