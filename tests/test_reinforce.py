"""REINFORCE with the group's mean as the baseline: the advantages, the batch of answers, and a gradient equal to
one computed by hand on a tiny model."""

from types import SimpleNamespace

import pytest
import torch

from conftest import tiny_model
from gptkit.chat.reinforce import (RLConfig, advantages, answer_batch, fewer_problems_note, little_reward_note,
                                   reinforce_loss)


def test_advantages_are_rewards_less_their_groups_mean():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 1.0]])
    assert torch.equal(advantages(rewards), torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.0] * 4,
                                                          [-0.25, -0.25, -0.25, 0.75]]))


def test_the_batch_scores_only_the_answers_and_leaves_out_groups_with_nothing_to_teach():
    prompts = [[1, 2, 3], [4, 5]]
    answers = [[[6, 7], [8]], [[9], [10, 11, 12]]]
    x, y, w = answer_batch(prompts, answers, [[0.5, -0.5], [0.0, 0.0]])
    assert torch.equal(x, torch.tensor([[1, 2, 3, 6], [1, 2, 3, 0]]))
    assert torch.equal(y, torch.tensor([[-1, -1, 6, 7], [-1, -1, 8, -1]]))
    assert torch.equal(w, torch.tensor([0.5, -0.5]))
    assert answer_batch(prompts, answers, [[0.0, 0.0], [0.0, 0.0]]) is None


def hand_gradient(model, prompts, answers, weights, vocab_size=None):
    """REINFORCE's gradient by its definition, one answer and one token at a time on full contexts:
    -(1/N) Σ_answers A Σ_t ∇ log p(a_t | prompt, a_<t), p over the first vocab_size tokens."""
    model.zero_grad()
    n_tokens = sum(len(a) for group in answers for a in group)
    for prompt, group, ws in zip(prompts, answers, weights):
        for answer, w in zip(group, ws):
            for t in range(len(answer)):
                context = torch.tensor([prompt + answer[:t]])
                logits, _ = model(context)
                logp = torch.log_softmax(logits[0, -1, :vocab_size].float(), -1)[answer[t]]
                (-w * logp / n_tokens).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


def assert_the_hand_gradient(model, prompts, answers, weights, vocab_size=None):
    """Assert that reinforce_loss's gradient on the batch is hand_gradient's, parameter by parameter; return that."""
    expected = hand_gradient(model, prompts, answers, weights, vocab_size)
    model.zero_grad()
    reinforce_loss(model, *answer_batch(prompts, answers, weights), vocab_size=vocab_size).backward()
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, expected[name], rtol=1e-4, atol=1e-7), name
    return expected


def test_the_gradient_is_reinforces_computed_by_hand():
    model = tiny_model(seed=3)
    prompts = [[1, 2, 3], [4, 5]]
    answers = [[[6, 7, 30], [8, 30]], [[9, 30], [10, 11, 12, 30]]]
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    weights = advantages(rewards).tolist()
    expected = assert_the_hand_gradient(model, prompts, answers, weights)
    assert any(g.abs().sum() > 0 for g in expected.values())


def test_a_padded_heads_extra_rows_are_not_in_the_policy():
    # a head padded past the tokenizer's vocabulary (gpt2's 50,257 to 50,304): sampling never draws its extra
    # rows, so the policy's log p is over the tokenizer's tokens, and those rows get no gradient
    model = tiny_model(seed=4)
    vocab_size = model.config.vocab_size - 8
    prompts, answers = [[1, 2], [3]], [[[6, 7], [8]], [[9, 5], [4]]]
    weights = advantages(torch.tensor([[1.0, 0.0], [0.0, 1.0]])).tolist()
    assert_the_hand_gradient(model, prompts, answers, weights, vocab_size)
    assert model.lm_head.weight.grad[vocab_size:].abs().sum() == 0


@pytest.mark.parametrize("setting, expected", [
    (dict(samples=1), "samples must be at least 2: the group's mean reward is each answer's baseline (got 1)"),
    (dict(samples=0), "samples must be at least 2: the group's mean reward is each answer's baseline (got 0)"),
    (dict(temperature=0.0), "temperature must be above 0: at 0 every answer to a problem is the same greedy one, "
                            "and none can be better than the group's mean (got 0.0)"),
    (dict(tasks=" , "), "tasks must name at least one task to practise (e.g. addition)"),
    (dict(init_from=""), "init_from is empty: name the folder of the chat run to start from (e.g. out-chat-early)"),
    (dict(init_checkpoint="iter:abc"), "init_checkpoint must be 'best' (best.pt), 'latest' (latest.pt) or 'iter:N' "
                                       "(the snapshot of iteration N), got 'iter:abc'"),
])
def test_settings_that_leave_reinforce_nothing_to_learn_from_are_one_line(setting, expected):
    with pytest.raises(ValueError) as e:
        RLConfig(**setting)
    assert str(e.value) == expected


def test_a_start_right_seldom_gets_a_note_that_rl_learns_little_from_it():
    """A start at 4% pass@1 (an early SFT stopped before its sums' sudden change) is told to fine-tune further;
    one never right is no_reward_line's, and one right half the time is what RL is for. Samples never right while
    the greedy answer sometimes is: the note, and the temperature that keeps them apart."""
    cfg = SimpleNamespace(init_from="out-chat-early", temperature=1.0)
    note = little_reward_note(cfg, {"pass_at_1": 0.043, "accuracy": 0.059})
    assert note.startswith("note: out-chat-early's held-out pass@1 is 4.3% at the start: RL sharpens")
    assert "until pass@1 reaches about 40%" in note
    assert little_reward_note(cfg, {"pass_at_1": 0.0, "accuracy": 0.4}).startswith(
        "note: out-chat-early's held-out pass@1 is 0.0% at the start (its greedy answer is right 40.0% of the time, "
        "its samples at temperature 1 never: a lower --temperature samples nearer the greedy answer): RL sharpens")
    assert little_reward_note(cfg, {"pass_at_1": 0.0, "accuracy": 0.0}) is None
    assert little_reward_note(cfg, {"pass_at_1": 0.43, "accuracy": 0.5}) is None


def test_a_dataset_with_fewer_held_out_problems_than_asked_says_what_is_scored():
    """eval_problems=5000 of a dataset that holds 50 of one task: pass@1 is of those 50, said once at the start."""
    cfg = RLConfig(init_from="out-chat", eval_problems=200)
    heldout = {"addition": [None] * 50, "reverse": [None] * 200}
    assert fewer_problems_note(cfg, heldout) == ("note: the dataset holds fewer held-out problems than "
                                                 "eval_problems=200: pass@1 is scored on addition's 50 and "
                                                 "reverse's 200")
    assert fewer_problems_note(cfg, {"reverse": [None] * 200}) is None
