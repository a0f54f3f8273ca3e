"""Hypothesis settings profiles for the property tests, chosen by ``KLPPO_HYPOTHESIS_PROFILE``.

* ``default`` (variable unset): 200 examples per property, a fresh random seed each run; a
  failing example is saved in ``.hypothesis/`` and replayed first on the next run.
* ``big``: ``KLPPO_HYPOTHESIS_MAX_EXAMPLES`` examples per property (20000 unless set), a fresh
  random seed, no example database (nothing replayed, nothing saved). Hypothesis marks every
  ``@given`` test ``hypothesis``, so the whole property suite is::

      KLPPO_HYPOTHESIS_PROFILE=big python -m pytest tests -m hypothesis -q

* ``nodb``: the default budget without the example database, for repeated independent runs.

Property tests set no ``max_examples`` of their own, so the profile decides their budget.
"""

import os

from hypothesis import settings

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile(
    "big",
    max_examples=int(os.environ.get("KLPPO_HYPOTHESIS_MAX_EXAMPLES", "20000")),
    deadline=None,
    derandomize=False,
    database=None,
)
settings.register_profile("nodb", max_examples=200, deadline=None, database=None)
settings.load_profile(os.environ.get("KLPPO_HYPOTHESIS_PROFILE", "default"))

pytest_plugins = ["tests.signalguard"]
