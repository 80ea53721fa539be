"""`nemo-topr doctor`: check a new node end to end (`command`), with its harness (`runner`), its checks
(`checks`, `versions`) and the two checks that run in processes of their own (`te_attention`,
`packed_parity`, each `python -m nemo_topr.doctor.NAME`)."""
