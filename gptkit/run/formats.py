"""This project's own earlier file formats, read in one place: a checkpoint of an earlier format version is
brought to the current one as it loads, so that no reader of a checkpoint branches on what an earlier version of
this tool wrote or left out.

Checkpoint formats:
1. every version before the format numbers below; its later files already hold every field of format 2, its
   earlier ones may lack some: the time spent (saved as loop_seconds or train_time, or not at all), best_iter,
   global_batch, wandb_id and the start-up choices (measured).
2. every field a resume reads is there.
"""

CHECKPOINT_FORMAT = 2


def upgraded_checkpoint(state):
    """A checkpoint's dict of any format this tool reads, as the current format holds it (changed in place)."""
    if state.get("format_version") == 1:
        if "iter_num" in state and "optimizer" in state:  # a training state (latest.pt), not best.pt's weights
            spent = state.pop("loop_seconds", state.pop("train_time", 0.0))
            state.setdefault("seconds_spent", spent)
            state.setdefault("best_iter", 0)
            state.setdefault("wandb_id", None)
            state.setdefault("measured", {})
            state.setdefault("global_batch", started_with(state))
        state["format_version"] = 2
    return state


def started_with(state):
    """The sequences a step a format-1 state trained on: batch_size x gradient_accumulation_steps divided among the
    processes that wrote it (one random state each), at least one micro-batch each."""
    config, processes = state.get("config") or {}, len(state.get("rng") or [None])
    batch, accumulation = config.get("batch_size", 12), config.get("gradient_accumulation_steps", 1)
    return batch * processes * max(1, accumulation // processes)
