"""Fine-tuning dynamics (issue 52): the states a run keeps (finetune.keep_states, layersim.training.states) and the
dynamics stage's numbers (layersim.experiments.dynamics). The resumed run's states: tests/test_resume.py; the stage in
the pipeline: tests/test_pipeline.py."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from layersim.errors import LayersimError
from layersim.experiments.dynamics import dynamics_pooling, half_way_step, layer_cka
from layersim.params import FinetuneParams
from layersim.params.schema import LoraParams
from layersim.similarity.results import Uncertainty
from layersim.training.states import INDEX, StateKeeper, kept_steps, load_state, read_index, step_folder

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("max_steps, keep, steps", [
    (24, 3, (6, 12, 18)), (10, 4, (2, 4, 6, 8)), (6, 2, (2, 4)), (3, 2, (1, 2)), (10000, 0, ()), (7, 1, (4,)),
    (10, 9, tuple(range(1, 10))),
])
def test_states_are_evenly_spaced_between_orig_and_the_final_model(max_steps, keep, steps):
    assert kept_steps(max_steps, keep) == steps


def test_every_spacing_gives_distinct_steps_inside_the_run():
    for max_steps in range(1, 60):
        for keep in range(max_steps):
            steps = kept_steps(max_steps, keep)
            assert len(set(steps)) == keep and all(0 < s < max_steps for s in steps), (max_steps, keep)
            gaps = np.diff([0, *steps, max_steps])
            assert gaps.max() - gaps.min() <= 1  # as even as whole steps allow


def test_keeping_as_many_states_as_steps_is_refused():
    with pytest.raises(LayersimError, match="keep_states = 6 must be .* smaller than finetune.max_steps = 6"):
        kept_steps(6, 6)


def test_params_refuse_keep_states_of_max_steps(tmp_path):
    from dvc_project import repository_params, tiny_params
    from layersim.params import load_params
    import yaml

    params = tiny_params(repository_params())
    params["finetune"]["keep_states"] = params["finetune"]["max_steps"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(LayersimError, match="finetune.keep_states = 6 must be smaller than finetune.max_steps = 6"):
        load_params(tmp_path / "params.yaml")


def test_a_resumed_run_keeps_the_states_up_to_its_resume_point(tmp_path):
    """States staged after the point a killed run resumes from are written again (they were computed after the saved
    training state), those before it kept; a run that starts over keeps none; leftovers of a killed write go."""
    keeper = StateKeeper(tmp_path / "staging", (2, 4, 6))
    for step in (2, 4, 6):
        step_folder(keeper.staging, step).mkdir(parents=True)
    (keeper.staging / ".step8.host-1-x.tmp").mkdir()
    keeper.start(4)
    assert sorted(p.name for p in keeper.staging.iterdir()) == ["step2", "step4"]
    keeper.start(0)
    assert list(keeper.staging.iterdir()) == []


def _finetune(folder, params, keep, seed=0):
    from layersim.data.batching import encode_task
    from layersim.data.tasks import generated_table, get_task
    from layersim.models.registry import load_tokenizer
    from layersim.training import train

    spec = get_task("synth-negation")
    tokenizer = load_tokenizer(folder)
    splits = [encode_task(generated_table(spec, split, n, seed=0), spec, tokenizer, params.max_length)
              for split, n in (("train", 32), ("validation", 16))]
    return train.finetune(folder, spec, *splits, params, seed, device=torch.device("cpu"), keep=keep)


FULL = FinetuneParams(batch_size=4, learning_rate=1e-3, warmup_steps=1, max_steps=6, eval_every=0, max_length=32,
                      keep_states=2)


def test_kept_states_rebuild_the_encoder_and_are_published_with_their_index(tmp_path, tiny_model_dir):
    from layersim.models.registry import load_encoder, load_tokenizer
    from layersim.training.train import save_checkpoint

    pretrained = tiny_model_dir("tiny-bert")
    keeper = StateKeeper.for_run(FULL, tmp_path / "states", tmp_path / "resume")
    model, _ = _finetune(pretrained, FULL, keeper)
    assert sorted(p.name for p in keeper.staging.iterdir()) == ["step2", "step4"]
    save_checkpoint(model, load_tokenizer(pretrained), tmp_path / "model", base_dir=pretrained,
                    task="synth-negation", seed=0)
    keeper.publish(tmp_path / "states", tmp_path / "model", FULL.max_steps)
    assert not keeper.staging.exists()
    digest = json.loads((tmp_path / "model" / "layersim_model.json").read_text())["digest"]
    from layersim.models.registry import file_digest

    assert read_index(tmp_path / "states", digest) == {
        "steps": [2, 4], "max_steps": 6, "checkpoint_digest": digest,
        "digests": {f"step{s}": file_digest(step_folder(tmp_path / "states", s) / "model.safetensors") for s in (2, 4)}}
    with pytest.raises(LayersimError, match="belong to another checkpoint"):
        read_index(tmp_path / "states", "0" * 64)
    before, final = load_encoder(pretrained).state_dict(), model.base_model.state_dict()
    moved = []
    for step in (2, 4):
        state = load_state(load_encoder(tmp_path / "model"), step_folder(tmp_path / "states", step)).state_dict()
        assert state.keys() == final.keys()
        moved.append(sum(float((state[k] - before[k]).norm()) for k in before))
        assert any(not torch.equal(state[k], final[k]) for k in final)  # a state before the end, not the end
    assert 0 < moved[0] < moved[1]  # weights drift away from the pretrained ones as training goes on
    (tmp_path / "states" / INDEX).write_text("{")
    with pytest.raises(LayersimError, match="cannot be read"):
        read_index(tmp_path / "states", digest)


def test_a_lora_runs_states_are_its_merged_weights(tmp_path, tiny_model_dir):
    """Under LoRA a state is the plain encoder with the adapters' updates merged (the training model untouched):
    only the adapted matrices differ from the pretrained ones."""
    from layersim.models.registry import load_encoder

    pretrained = tiny_model_dir("tiny-bert")
    lora = dataclasses.replace(FULL, learning_rate=1e-2, method="lora", lora=LoraParams(rank=2, alpha=4.0))
    keeper = StateKeeper(tmp_path / "staging", kept_steps(lora.max_steps, lora.keep_states))
    _finetune(pretrained, lora, keeper)
    before = load_encoder(pretrained).state_dict()
    state = load_state(load_encoder(pretrained), step_folder(keeper.staging, 4)).state_dict()
    changed = sorted(name for name in before if not torch.equal(before[name], state[name]))
    # the adapted matrices and the pooler, which LoRA trains with the head (layersim.training.adapters)
    assert changed == sorted([f"encoder.layer.{i}.attention.self.{role}.weight" for i in range(3)
                              for role in ("query", "value")] + ["pooler.dense.bias", "pooler.dense.weight"])


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory, tiny_model_dir):
    """Two seeds' published states (steps 2 and 4 of 6) beside their checkpoints, as the finetune stage writes them;
    each test tampers with a copy."""
    from layersim.models.registry import load_tokenizer
    from layersim.training.train import save_checkpoint

    root, pretrained = tmp_path_factory.mktemp("kept"), tiny_model_dir("tiny-bert")
    for seed in (1, 2):
        run = root / f"seed{seed}"
        keeper = StateKeeper.for_run(FULL, run / "states", run / "resume")
        model, _ = _finetune(pretrained, FULL, keeper, seed=seed)
        save_checkpoint(model, load_tokenizer(pretrained), run / "model", base_dir=pretrained, task="synth-negation",
                        seed=seed)
        keeper.publish(run / "states", run / "model", FULL.max_steps)
    return root


def _copy_runs(two_runs, tmp_path):
    import shutil

    from layersim.models.registry import model_info

    shutil.copytree(two_runs, tmp_path / "runs")
    states = tmp_path / "runs" / "seed1" / "states"
    return states, model_info(tmp_path / "runs" / "seed1" / "model")["digest"]


def _swap_steps(states, other):
    a, b = (step_folder(states, s) / "model.safetensors" for s in (2, 4))
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def _other_seeds_state(states, other):
    (step_folder(states, 2) / "model.safetensors").write_bytes((step_folder(other, 2) / "model.safetensors").read_bytes())


def _zero_weights(states, other):
    from safetensors.torch import load_file, save_file

    path = step_folder(states, 2) / "model.safetensors"
    save_file({name: torch.zeros_like(value) for name, value in load_file(str(path)).items()}, str(path))


def _garbage(states, other):
    (step_folder(states, 2) / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))


def _cut_short(states, other):
    path = step_folder(states, 2) / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.mark.parametrize("tamper", [_swap_steps, _other_seeds_state, _zero_weights, _garbage, _cut_short],
                         ids=["swapped steps", "another seed's state", "all-zero weights", "garbage bytes",
                              "a cut-short file"])
def test_a_tampered_kept_state_is_refused_in_one_sentence_naming_it(two_runs, tmp_path, tamper):
    """Each of these was accepted (a different dynamics headline, exit 0) or ended in a traceback (issue 62): now the
    state's digest, recorded when the run kept it, refuses it before the dynamics stage measures anything."""
    states, digest = _copy_runs(two_runs, tmp_path)
    read_index(states, digest)  # untouched: accepted
    tamper(states, tmp_path / "runs" / "seed2" / "states")
    with pytest.raises(LayersimError) as refused:
        read_index(states, digest)
    message = str(refused.value)
    assert f"{step_folder(states, 2) / 'model.safetensors'}" in message and "re-run the finetune stage" in message
    assert message.count(". ") == 0 and message.endswith(".") and "\n" not in message  # one sentence


@pytest.mark.parametrize("tamper", [_garbage, _cut_short], ids=["garbage bytes", "a cut-short file"])
def test_a_state_file_safetensors_cannot_read_is_one_sentence_too(two_runs, tmp_path, tamper):
    """load_state on its own (no index read first) turns safetensors' header error into the same kind of answer."""
    from layersim.models.registry import load_encoder

    states, _ = _copy_runs(two_runs, tmp_path)
    tamper(states, None)
    with pytest.raises(LayersimError, match=r"the kept state .*step2/model.safetensors cannot be loaded into .*re-run the "
                                            "finetune stage"):
        load_state(load_encoder(tmp_path / "runs" / "seed1" / "model"), step_folder(states, 2))


@pytest.mark.parametrize("edit, refusal", [
    (lambda index: index | {"steps": [4, 2]}, "not the evenly spaced ascending steps"),
    (lambda index: index | {"steps": [2, 3]}, "not the evenly spaced ascending steps"),
    (lambda index: index | {"max_steps": "6"}, "not the evenly spaced ascending steps"),
    (lambda index: {k: v for k, v in index.items() if k != "digests"}, "no digest for every state"),
    (lambda index: index | {"digests": {"step2": index["digests"]["step2"]}}, "no digest for every state"),
    (lambda index: [index], "holds no JSON object"),
], ids=["steps out of order", "steps not kept", "max_steps not a number", "an index without digests",
        "a digest missing", "a list"])
def test_an_index_whose_steps_or_digests_do_not_fit_is_refused(two_runs, tmp_path, edit, refusal):
    states, digest = _copy_runs(two_runs, tmp_path)
    index = json.loads((states / INDEX).read_text())
    (states / INDEX).write_text(json.dumps(edit(index)))
    with pytest.raises(LayersimError, match=f"{refusal}.*re-run the finetune stage"):
        read_index(states, digest)


def test_another_runs_states_are_refused_whole(two_runs, tmp_path):
    """The other seed's whole states folder (its own index and states, all consistent) belongs to its checkpoint."""
    import shutil

    states, digest = _copy_runs(two_runs, tmp_path)
    shutil.rmtree(states)
    shutil.copytree(tmp_path / "runs" / "seed2" / "states", states)
    with pytest.raises(LayersimError, match="belong to another checkpoint"):
        read_index(states, digest)


def _layers(rng, n=40, widths=(6, 8, 8)):
    return [rng.standard_normal((n, w)) for w in widths]


EXACT = Uncertainty(permutations=20, bootstrap=30, seed=0)


def test_a_state_against_itself_is_one_at_every_defined_layer():
    rng = np.random.default_rng(0)
    point = [np.ones((40, 4))] + _layers(rng)  # layer 0 constant, as CLS at the embeddings: no similarity
    found = layer_cka(point, {"ORIG": point, "final": [layer.copy() for layer in point]}, EXACT, None)
    for reference in ("ORIG", "final"):
        values = found[reference]
        assert np.isnan(values["linear_cka"][0]) and np.isnan(values["p_value"][0])
        np.testing.assert_allclose(values["linear_cka"][1:], 1.0, atol=1e-9)
        assert (values["null_mean"][1:] < 0.5).all() and (values["p_value"][1:] < 0.01).all()
        assert (values["ci_low"][1:] <= 1.0 + 1e-9).all() and (values["ci_high"][1:] >= 1.0 - 1e-6).all()


def test_a_hand_built_case():
    """A rotated and scaled copy is CKA 1 (linear CKA is invariant to both); half a layer's columns kept gives the
    formula's value; an unrelated layer sits at its null, not above chance. Words of one example (groups) are
    permuted and resampled together."""
    rng = np.random.default_rng(1)
    n = 60
    x = rng.standard_normal((n, 4)) * np.array([3.0, 2.0, 1.0, 0.5])
    rotation, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    half = x[:, :2]
    unrelated = rng.standard_normal((n, 4))
    point = [x, x, x]
    found = layer_cka(point, {"ORIG": [3 * x @ rotation, half, unrelated]}, EXACT, None)["ORIG"]
    c, h = x - x.mean(0), half - half.mean(0)
    expected = np.linalg.norm(h.T @ c) ** 2 / (np.linalg.norm(c.T @ c) * np.linalg.norm(h.T @ h))
    np.testing.assert_allclose(found["linear_cka"][:2], [1.0, expected], rtol=1e-9)
    assert found["p_value"][2] > 0.05 and abs(found["linear_cka"][2] - found["null_mean"][2]) < 0.15
    groups = np.repeat(np.arange(n // 3), 3)
    blocked = layer_cka(point, {"ORIG": [3 * x @ rotation, half, unrelated]}, EXACT, groups)["ORIG"]
    np.testing.assert_allclose(blocked["linear_cka"], found["linear_cka"], rtol=1e-9)  # the values: the same
    assert not np.allclose(blocked["null_mean"], found["null_mean"])  # their null: whole examples permuted


def test_the_half_way_step_is_interpolated_between_the_kept_points():
    assert half_way_step([0, 2, 4, 6], [1.0, 0.9, 0.6, 0.5]) == pytest.approx(3.0)  # distances 0, .1, .4, .5: .25 at 3
    assert half_way_step([0, 2, 4, 6], [1.0, 0.7, 0.8, 0.6]) == pytest.approx(4 / 3)  # moved early (.3 ≥ .2 by 2)
    assert half_way_step([0, 2, 4], [1.0, 0.8, 0.6]) == pytest.approx(2.0)  # exactly half at a kept point
    assert half_way_step([0, 6], [1.0, 0.8]) is None               # no kept state: the grid, not the run, decides
    assert half_way_step([0, 3, 6], [1.0, 1.0, 1.0]) is None       # never moved
    assert half_way_step([0, 3, 6], [float("nan")] * 3) is None    # undefined (a constant layer)
    assert half_way_step([0, 3, 6], [1.0, float("nan"), 0.8]) == pytest.approx(3.0)  # an undefined point skipped


@pytest.mark.parametrize("true_step, noise", [(53, 0.02), (53, 0.05), (39, 0.05)])
def test_a_half_way_step_between_kept_points_is_not_snapped_to_the_grid(true_step, noise):
    """The fidelity review's §5 design: smooth exponential moves to CKA 0.3 over 200 steps, states kept every 40,
    noise of sd 0.02–0.05 on each measured point. The first kept point past half read a true 53 as 80 in 98 % of
    draws; interpolated, it is 53 on average within a few steps and never the grid's 80 as a rule."""
    from scipy.optimize import brentq

    grid = np.arange(0, 201, 40)

    def moved(t, tau):
        return (1 - np.exp(-t / tau)) / (1 - np.exp(-200 / tau))

    tau = brentq(lambda tau: moved(true_step, tau) - 0.5, 1, 1e4)
    rng = np.random.default_rng(52)
    found = np.array([half_way_step(grid, 1 - 0.7 * moved(grid, tau) + np.r_[0, rng.normal(0, noise, 5)])
                      for _ in range(500)])
    assert abs(found.mean() - true_step) < 5 and abs(np.median(found) - true_step) < 5, (found.mean(), np.median(found))
    assert np.mean(found == 80) < 0.05 and np.mean(np.abs(found - true_step) < 20) > 0.9


def test_the_half_way_headline_is_absent_without_kept_states_and_has_a_seed_spread():
    from layersim.experiments.dynamics import half_way_headline

    assert half_way_headline([(None, [0, 200]), (None, [0, 200])]) == {}
    headline = half_way_headline([(50.0, [0, 40, 80, 120, 160, 200]), (70.0, [0, 40, 80, 120, 160, 200]),
                                  (None, [0, 40, 80, 120, 160, 200])])
    assert headline == {"top_layer_half_way_step": 60.0, "top_layer_half_way_share": 0.3,
                        "top_layer_half_way_step_sd": pytest.approx(np.std([50, 70], ddof=1)),
                        "top_layer_half_way_grid": 40}
    assert "top_layer_half_way_step_sd" not in half_way_headline([(50.0, [0, 40, 100])])  # one run: no spread


def test_the_dynamics_p_values_are_corrected_as_one_family_without_the_trivial_points():
    from layersim.experiments.dynamics import _corrected

    p = {step: {"ORIG": {"p_value": np.array([0.01, 0.04])}, "final": {"p_value": np.array([0.03, 0.5])}}
         for step in (0, 5, 10)}
    runs = {"seed1": {"steps": [0, 5, 10], "values": p}}
    family = _corrected(runs, "fdr_bh")
    assert family == {"correction": "fdr_bh", "tests": 8}  # 12 cells less step 0 to ORIG and step 10 to final
    assert np.isnan(p[0]["ORIG"]["p_adjusted"]).all() and np.isnan(p[10]["final"]["p_adjusted"]).all()
    # BH over the 8: sorted 0.01, 0.01, 0.03, 0.03, 0.04, 0.04, 0.5, 0.5 → p·8/rank 0.08, 0.04, 0.08, 0.06, 0.064,
    # 0.0533, 0.571, 0.5, made monotone from the top: 0.04, 0.04, then 0.0533 up to rank 6, then 0.5
    assert p[5]["ORIG"]["p_adjusted"] == pytest.approx([0.04, 0.04 * 8 / 6])
    assert p[10]["ORIG"]["p_adjusted"] == pytest.approx([0.04, 0.04 * 8 / 6])
    assert p[0]["final"]["p_adjusted"] == pytest.approx([0.04 * 8 / 6, 0.5])
    assert _corrected({"seed1": {"steps": [0, 5], "values": {0: {"ORIG": {"linear_cka": np.ones(2)}}}}},
                      "fdr_bh") == {}


def test_the_dynamics_use_the_similarity_headlines_points():
    assert dynamics_pooling("tiny-bert", ("cls", "mean", "tokens")) == "cls"
    assert dynamics_pooling("tiny-gpt2", ("last", "tokens")) == "last"
    with pytest.raises(LayersimError, match="add head to it"):
        dynamics_pooling("tiny-bert", ("mean", "tokens"))


def test_the_headline_gives_the_size_of_the_move_beside_the_half_way_step():
    """Full fine-tuning's top layer ends at CKA 0.04 to ORIG, LoRA's at 0.84: both half-way at step 1.6 (interpolated:
    0.48 of 0.6 by step 2, and 0.08 of 0.1), but LoRA's move is 0.16 against 0.96, and the headline says so per
    method."""
    from layersim.experiments.dynamics import DynamicsOutputs, _summarise

    def run(method, label, cka_top):
        values = {step: {"ORIG": {"linear_cka": np.array([1.0, top])}} for step, top in zip((0, 2, 4), cka_top)}
        return {"seed": 1, "label": label, "method": method, "steps": [0, 2, 4], "values": values}

    out = DynamicsOutputs(full={"pooling": "cls"})
    _summarise(out, {"seed1": run(None, "FT[1]", (1.0, 0.4, 0.04)),
                     "lora-seed1": run("lora", "LoRA[1]", (1.0, 0.9, 0.84))}, num_layers=2)
    assert out.headline["top_layer_half_way_step"] == pytest.approx(1.6)
    assert out.headline["compared"]["lora"]["top_layer_half_way_step"] == pytest.approx(1.6)
    assert out.headline["top_layer_final_distance"] == pytest.approx(0.96)
    assert out.headline["compared"]["lora"]["top_layer_final_distance"] == pytest.approx(0.16)
