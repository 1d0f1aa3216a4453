"""Suite-wide settings: property tests have no per-example deadline (the CI machine is shared and slow)."""

from hypothesis import settings

settings.register_profile("kq", deadline=None, print_blob=True)
settings.load_profile("kq")
