"""`doctor`'s readiness checks: does the whole serving stack of this environment run on the GPUs it found?"""
