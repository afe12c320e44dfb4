import os

from hypothesis import settings

# CI must be deterministic; a local run can opt into fresh examples with HYPOTHESIS_PROFILE=dev.
settings.register_profile("ci", derandomize=True, deadline=None, max_examples=60, print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
