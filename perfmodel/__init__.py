"""Bandwidth model of DSpark decode on a DGX Spark pair (the seed's "Performance model").

Modules: `paging` (distinct experts touched when verifying M tokens, closed forms and a
Monte-Carlo), `budget` (per-verify-step time budget, steps/s, tok/s, aggregate ceiling),
`turn` (a chat turn's prefill floor, next to re-tokenizing the history), `report` (table and
JSON), `cli` (flags; run as `python -m perfmodel`).
"""
