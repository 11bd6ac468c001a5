"""Judging a model: how good it is, how far to trust its scores, and where it goes wrong.

evaluate (a split scored into the per-image results table: results.py), the decision rule's fit
(calibrate.py: temperature, ECE, reject threshold; decision.py: evaluate's fit, save and test-time
augmentation measurement), the error report with likely label errors, compare (two tables, McNemar)
and explain (Grad-CAM). Applying the rule is models/rule.py's; making inference fast is infer/'s.
"""
