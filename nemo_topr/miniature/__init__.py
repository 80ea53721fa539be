"""A CPU miniature of the TOPR paper's claims (`make miniature`, docs/miniature.md).

task.py      synthetic multi-step arithmetic word problems with chain-of-thought and an exact answer
pipeline.py  pretrain (SFT) -> sample k per prompt -> grade -> score log mu -> train variants -> eval
report.py    Markdown table and PNG plots from the pipeline's results.json
study.py     the pre-registered study of issue 19 (`make miniature-study`), built on pipeline.py
stats.py     its paired sign tests and decision rules (pure)
study_report.py  its report: decisions, manipulation check, paired comparisons, plot
"""
