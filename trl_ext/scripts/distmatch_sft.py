"""Training process of `distmatch-trl sft` (run by `accelerate launch`; see `trl_ext.cli`)."""

from trl_ext.cli import sft_worker

if __name__ == "__main__":
    sft_worker()
