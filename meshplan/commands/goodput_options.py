"""The time-to-train options shared by ``meshplan cost`` and ``meshplan tune`` (issue 41):
``--tokens``, ``--price`` / ``--prices``, ``--checkpoint``, ``--checkpoint-interval``,
``--spares``, ``--jitter-samples`` / ``--jitter-seed`` and tune's ``--deadline``; their parsing
and the rules behind them live in ``meshplan.goodput_inputs``.
"""

from __future__ import annotations

import typer

from meshplan.commands import options as opt

TOKENS = typer.Option(None, "--tokens", help="Tokens to train, e.g. 15T, 300B, 2.5e12: adds the "
                      "expected time to train and its breakdown (checkpoints, interruptions, restarts) "
                      "and, with a price, the cost.", rich_help_panel=opt.PANEL_TRAIN)
PRICE = typer.Option(None, "--price", help="Dollars per GPU-hour (default: the dated price table, "
                     "clusters/defaults/prices.yaml).", rich_help_panel=opt.PANEL_TRAIN)
PRICES = typer.Option(None, "--prices", help="A price table YAML (dollars per GPU-hour by device, "
                      "with date and source) instead of the default one.", rich_help_panel=opt.PANEL_TRAIN)
CHECKPOINT = typer.Option("auto", "--checkpoint", help="Checkpoint save: auto (asynchronous where the "
                          "framework saves so), sync or async.", rich_help_panel=opt.PANEL_TRAIN)
CHECKPOINT_INTERVAL = typer.Option(None, "--checkpoint-interval", min=1,
                                   help="Steps between checkpoints (default: the interval of least "
                                        "expected time, near Young's and Daly's).", rich_help_panel=opt.PANEL_TRAIN)
SPARES = typer.Option(0, "--spares", min=0, max=2**20, help="Hot spare nodes (billed): a restart "
                      "need not wait for a replacement node.", rich_help_panel=opt.PANEL_TRAIN)
JITTER_SAMPLES = typer.Option(None, "--jitter-samples", min=1, max=100_000,
                              help="Sample N steps with the cluster's stragglers and jitter on the "
                                   "SimPy engine: step-time P50 / P90 / P99 and what a slow GPU or "
                                   "link costs.", rich_help_panel=opt.PANEL_TRAIN)
JITTER_SEED = typer.Option(0, "--jitter-seed", min=0, max=2**31 - 1, help="Seed of --jitter-samples.", rich_help_panel=opt.PANEL_TRAIN)
DEADLINE = typer.Option(None, "--deadline", help="With --objective time-to-train / cost-to-train: "
                        "only plans that train the tokens within this time qualify, e.g. 30d, 720h.", rich_help_panel=opt.PANEL_TRAIN)

