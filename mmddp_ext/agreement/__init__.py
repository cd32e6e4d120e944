"""The ranks' agreement before step 1: the pure comparison and its screen (``compare.py``), the
collective that gathers every rank's view (``collective.py``), and ``AgreementHook``
(``hook.py``, registered on import; the default hook ``rank_agreement``)."""
