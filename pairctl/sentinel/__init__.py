"""The acceptance probe and the output canary (issue: silent half-speed decode and garbled
output keep a pair "healthy"). ``probe`` measures one fixed prompt's acceptance per draft
position, ``judgement`` judges it against the prompt's own record, ``probefile`` is the
record per stack, recipe and checkpoint, ``schedule`` is watch's probe rounds, ``canary``
the short-answer set, ``monitors`` what ``watch`` runs after each good token probe,
``record`` the ``sentinel record`` command."""
