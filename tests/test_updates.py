"""What a step does to the weights (gptkit/training/updates.py): the learning-rate schedule's edges, the rates
named for each optimizer, and the weight average step by step."""

from dataclasses import replace

import pytest
import torch

from conftest import tiny_model, train_config
from gptkit.training.train_config import TrainConfig
from gptkit.training.updates import EMA, lr_factor_at, rates, schedulable, set_lr, settings_untaken


# ---------------------------------------------------------------------------------------------- the rates

def test_each_optimizers_rate_is_named_for_it_and_follows_the_schedule():
    """Its default rate (AdamW's embeddings have their own) times the schedule's factor; a learner's SGD too."""
    cfg = train_config(optimizer="muon", learning_rate=1e-3, muon_lr=0.02, embedding_lr=0.05)
    model = tiny_model(config=cfg.model, vocab_size=20)
    optimizers = schedulable(model.configure_optimizers(cfg))
    set_lr(optimizers, 0.5)
    assert rates(optimizers) == pytest.approx({"adamw_lr": 5e-4, "muon_lr": 0.01})
    sgd = schedulable(torch.optim.SGD(model.parameters(), lr=0.1))
    assert rates(sgd + sgd) == {"sgd_lr": 0.1, "sgd2_lr": 0.1}


# ---------------------------------------------------------------------------------------------- the schedule

def schedule(**overrides):
    return replace(TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=100), **overrides)



def test_warmup_reaches_the_peak_and_cosine_ends_at_min_lr():
    cfg = schedule()
    assert lr_factor_at(cfg, 0) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 9) == pytest.approx(1.0)
    assert lr_factor_at(cfg, 10) == pytest.approx(1.0)
    assert lr_factor_at(cfg, 100) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 500) == pytest.approx(0.1)  # flat at min_lr after lr_decay_iters


def test_warmup_equal_to_decay_never_divides_by_zero():
    cfg = schedule(warmup_iters=50, lr_decay_iters=50)
    assert [lr_factor_at(cfg, it) for it in (49, 50, 51)] == pytest.approx([1.0, 0.1, 0.1])


def test_constant_lr_without_decay_has_no_warmup():
    assert lr_factor_at(schedule(decay_lr=False), 0) == 1.0


def test_wsd_is_flat_then_linear_to_min_lr():
    cfg = schedule(lr_schedule="wsd", warmdown_frac=0.4)
    assert lr_factor_at(cfg, 59) == 1.0
    assert lr_factor_at(cfg, 80) == pytest.approx(1.0 - 0.5 * 0.9)
    assert lr_factor_at(cfg, 100) == pytest.approx(0.1)


def test_a_budget_by_the_clock_drives_the_decay_and_a_planned_one_does_not():
    planned = schedule(lr_schedule="wsd", warmdown_frac=0.4, max_time=100.0)
    assert lr_factor_at(planned, 20, time_progress=0.8) == 1.0  # its steps are planned: they alone say
    cfg = schedule(lr_schedule="wsd", warmdown_frac=0.4, max_time=100.0, wall_clock=True)
    assert lr_factor_at(cfg, 20, time_progress=0.1) == 1.0  # iterations ahead of time
    assert lr_factor_at(cfg, 20, time_progress=0.8) == pytest.approx(1.0 - 0.5 * 0.9)  # time ahead
    assert lr_factor_at(cfg, 20, time_progress=1.0) == pytest.approx(0.1)
    assert lr_factor_at(cfg, 5, time_progress=0.9) == pytest.approx(0.6)  # warmup still counts steps


# ---------------------------------------------------------------------------------------------- the weight average

def test_the_weight_average_follows_the_weights_at_the_peak_and_averages_more_as_the_rate_decays():
    """Against the average written out step by step; the state dict gives it under both names of a tied table,
    and swapping it in for an evaluation leaves the weights as they were."""
    model = tiny_model(config=train_config(tie_weights=True).model, vocab_size=20)
    params = list(model.parameters())
    average = EMA(model, decay=0.9)
    expected = [p.detach().clone() for p in params]
    generator = torch.Generator().manual_seed(0)
    for lr in (0.5, 1.0, 0.25, 0.0, 0.0):
        with torch.no_grad():
            for p in params:
                p.add_(torch.randn(p.shape, generator=generator))
        average.update(lr)
        step = 1 - 0.9 * (1 - lr)  # at the peak (lr 1) a step all the way to the weights
        expected = [e + step * (p.detach() - e) for e, p in zip(expected, params)]
        for a, e in zip(average.values, expected):
            torch.testing.assert_close(a, e)
    state = average.state_dict()
    assert state["lm_head.weight"].data_ptr() == state["transformer.wte.weight"].data_ptr()
    torch.testing.assert_close(state["transformer.wte.weight"], expected[0])
    weights = [p.detach().clone() for p in params]
    x = torch.randint(0, 20, (2, 16))
    with average.swapped_in():
        inside = model(x)[0]
    reference = tiny_model(config=train_config(tie_weights=True).model, vocab_size=20)
    reference.load_state_dict(state)
    torch.testing.assert_close(inside, reference(x)[0])
    for p, w in zip(params, weights):
        assert torch.equal(p, w)


@pytest.mark.parametrize("returned, said", [(None, "None"), ([], "an empty list"), ("adam", "a str"),
                                            ([torch.nn.Linear(2, 2)], "a Linear")])
def test_configure_optimizers_returning_no_optimizer_is_one_line(returned, said):
    """A learner's configure_optimizers that returns none would fail inside the loop, or, an empty list, train
    nothing without a word."""
    from gptkit.base.errors import UserError

    with pytest.raises(UserError, match=rf"^model.py's GPT.configure_optimizers returned {said}: it must return a "
                                        "torch optimizer, or a list of them"):
        schedulable(returned)


@pytest.mark.parametrize("damage", ["a moment of another shape", "a weight it does not have"])
def test_an_optimizer_state_that_fits_no_weight_is_one_line(damage):
    """A moment of another shape than its weight's made the fused AdamW step crash the process, with no line."""
    from gptkit.base.errors import UserError
    from gptkit.training.updates import restore_optimizers

    model = tiny_model()
    optimizers = schedulable(model.configure_optimizers(train_config(optimizer="adamw")))
    model(*[torch.zeros((1, 4), dtype=torch.long)] * 2)[1].backward()
    optimizers[0].step()
    state = optimizers[0].state_dict()
    if damage == "a weight it does not have":
        state["param_groups"][0]["params"][0] = 10 ** 6  # its state, kept under its own number, names no weight
    else:
        state["state"][0]["exp_avg"] = torch.zeros(3)
    with pytest.raises(UserError, match="^the checkpoint's optimizer state is damaged: its state of weight"):
        restore_optimizers(schedulable(model.configure_optimizers(train_config(optimizer="adamw"))), [state])


def test_optimizer_settings_given_that_configure_optimizers_does_not_take_are_named():
    """configure_optimizers edited to SGD at lr 0.1 (as the README shows): --learning_rate, --weight_decay and
    --optimizer given on the command line change nothing, which a note says; as written, every one shows in a
    group, and so does muon_lr with Muon, but not with AdamW."""
    asked = {"learning_rate", "weight_decay", "optimizer", "beta2", "max_iters", "embedding_lr"}  # 0: learning_rate's
    cfg = train_config(learning_rate=0.5, weight_decay=0.3, optimizer="muon", beta2=0.9, muon_lr=0.05)
    model = tiny_model()
    assert settings_untaken(schedulable(model.configure_optimizers(cfg)), cfg, asked | {"muon_lr"}) is None
    sgd = schedulable(torch.optim.SGD(model.parameters(), lr=0.1))
    assert settings_untaken(sgd, cfg, asked) == (
        "note: optimizer='muon', beta2=0.9, learning_rate=0.5, weight_decay=0.3, given for this run, are in none of "
        "the optimizers model.py's GPT.configure_optimizers builds (SGD (lr 0.1) over 27,168 parameters): it trains "
        "as that function is written")
    adamw = replace(cfg, optimizer="adamw")
    assert settings_untaken(schedulable(model.configure_optimizers(adamw)), adamw, {"muon_lr"}).startswith(
        "note: muon_lr=0.05, given for this run, is in none of the optimizers")
