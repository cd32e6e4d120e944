"""The entry layer: ``tools/dist_train.py``'s training entry (:mod:`.train`, its flags in
:mod:`.cli`), ``--explain`` (:mod:`.explain`) and its memory forecast (:mod:`.forecast`), and
``mmddp_ext.launch()`` (:mod:`.launch`). It wires the layers below; nothing below imports it.
"""
