# Puts the repository root on sys.path, so the tests import textkit from this checkout.
