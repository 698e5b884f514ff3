# Puts the repository root on sys.path, so the tests import shopcart from this checkout.
