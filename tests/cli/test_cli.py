import json

from typer.testing import CliRunner

from hippo_gpu.cli import app

runner = CliRunner()


def test_stats_json_has_the_documented_keys(sample_index_dir):
    res = runner.invoke(app, ["stats", str(sample_index_dir), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    for key in ("phrase_nodes", "passage_nodes", "facts", "fact_edges", "synonym_edges",
                "passage_edges", "nodes", "edges", "malformed_triples"):
        assert isinstance(s[key], int), key
    assert s["passage_nodes"] == 30 and s["nodes"] == s["phrase_nodes"] + 30
    assert s["basis_bytes"] > 0 and s["basis_steps"] > 0 and s["basis_damping"] == 0.5
    assert s["basis_seconds"] > 0


def test_index_and_eval_commands_on_the_sample(tmp_path):
    from hippo_gpu.sample import paths

    files = paths()
    data = tmp_path / "data"
    data.mkdir()
    for name in ("corpus", "questions"):
        (data / f"{name}.json").write_text(files[name].read_text())
    (data / "openie_sample.json").write_text(files["openie"].read_text())
    out = tmp_path / "idx"
    res = runner.invoke(app, ["index", "--corpus", str(data / "corpus.json"), "--openie",
                              str(data / "openie_sample.json"), "--out", str(out),
                              "--threads", "1", "--cache-dir", str(tmp_path / "cache")])
    assert res.exit_code == 0, res.output
    assert (out / "manifest.json").exists()
    bare = tmp_path / "bare"
    res = runner.invoke(app, ["index", "--corpus", str(data / "corpus.json"), "--openie",
                              str(data / "openie_sample.json"), "--out", str(bare),
                              "--threads", "1", "--cache-dir", str(tmp_path / "cache"),
                              "--no-ppr-basis"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["stats", str(bare), "--json"])
    assert json.loads(res.output)["basis_bytes"] == 0
    report = tmp_path / "eval.json"
    res = runner.invoke(app, ["eval", "--data", str(data), "--index-dir", str(out), "--modes",
                              "dense,hipporag2,hybrid", "--top-k", "10", "--json", str(report),
                              "--per-query", str(tmp_path / "pq.json")])
    assert res.exit_code == 0, res.output
    r = json.loads(report.read_text())
    assert set(r["modes"]) == {"dense", "hipporag2", "hybrid"} and r["n_questions"] == 4
    for m in r["modes"].values():
        assert set(m["recall"]) == {"1", "2", "5", "10"} and m["queries_per_s"] > 0
        assert 0 <= m["recall"]["10"] <= 100
    assert len(json.loads((tmp_path / "pq.json").read_text())) == 4


def test_errors_are_clear(tmp_path):
    res = runner.invoke(app, ["stats", str(tmp_path)])
    assert res.exit_code == 2 and "not a hippo-gpu index" in res.output
    res = runner.invoke(app, ["index", "--corpus", "x.json", "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--openie" in res.output


def test_demo_summarises_every_mode_honestly():
    import re

    res = runner.invoke(app, ["demo", "--threads", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    counts = {}
    for mode in ("dense", "hipporag2", "hybrid", "hipporag1"):
        m = re.search(rf"^{mode} +(\d+)/11 supporting passages in the top 3 \(top 10: "
                      rf"(\d+)/11\)", res.output, re.M)
        assert m, f"no summary line for {mode}:\n{res.output}"
        counts[mode] = int(m[1]), int(m[2])
    assert "heuristic entities" in res.output
    for mode in ("hipporag2", "hybrid", "hipporag1"):
        for k, i in ((3, 0), (10, 1)):
            got, dense = counts[mode][i], counts["dense"][i]
            verdict = ("on this tiny sample the graph does not help" if got < dense else
                       "a tie" if got == dense else f"{got - dense} more than dense")
            assert (f"{mode} finds {got}/11, dense {dense}/11 in the top {k}: {verdict}"
                    in res.output), res.output


def test_a_failed_ray_job_is_one_line_saying_a_rerun_resumes():
    """What `retrieve --ray` / `extract --ray` print when Ray gives up (its message carries the
    remote traceback): the error's first line only, and how to go on."""
    from hippo_gpu.cli.common import ray_failure

    class ActorUnavailableError(Exception):
        pass

    msg = ray_failure(ActorUnavailableError("\nThe actor 4b0e is unavailable: RpcError\n"
                                            "Traceback (most recent call last):\n  File x"))
    assert msg.startswith("the Ray job failed: ActorUnavailableError: The actor 4b0e is "
                          "unavailable: RpcError;")
    assert "Traceback" not in msg and "run the same command again" in msg


def test_extracting_with_a_local_model_says_once_on_stderr_it_is_a_demo(tmp_path):
    """`extract --llm local:...` prints one line on stderr (before any work, so a run that then
    fails still shows it) that the bundled model is a pipeline demo; a server LLM prints none.
    The corpus is missing, so no model is started."""
    missing = str(tmp_path / "missing.json")
    out = str(tmp_path / "openie.json")
    local = runner.invoke(app, ["extract", "--corpus", missing, "--llm", "local:smollm2",
                                "--out", out])
    notes = [line for line in local.stderr.splitlines() if "pipeline demo" in line]
    assert len(notes) == 1, local.stderr
    assert "local:smollm2" in notes[0] and "unreliable" in notes[0] and "vllm:" in notes[0]
    assert local.exit_code == 2 and "no such file" in local.stderr
    served = runner.invoke(app, ["extract", "--corpus", missing, "--llm",
                                 "openai:m@http://127.0.0.1:9/v1", "--out", out])
    assert served.exit_code == 2 and "pipeline demo" not in served.output

