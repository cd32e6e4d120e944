"""The ranks' agreement before step 1: the pure comparison and its screen (``compare.py``) and
the collective that gathers every rank's view (``collective.py``); ``AgreementHook``
(:mod:`mmddp_ext.hooks.agreement_hook`) runs them."""
