"""Acting on recommendations: ``graphmode launch`` (choose before start), ``graphmode watch`` (switch live).

:mod:`.policy` decides when a switch pays (pure, injectable clock); :mod:`.state` persists what the
controller must not forget; :mod:`.choose` picks the mode for ``launch``; :mod:`.proxy` and
:mod:`.controller` run and switch managed vLLM servers.
"""
