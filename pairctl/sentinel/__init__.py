"""The acceptance sentinel and the output canary (issue: silent half-speed decode and
garbled output keep a pair "healthy"). ``acceptance`` is the pure core, ``baseline`` the
recorded band per recipe, ``canary`` the exact-answer set, ``monitors`` what ``watch`` runs
after each good probe, ``record`` the ``python -m pairctl.sentinel record`` command."""
