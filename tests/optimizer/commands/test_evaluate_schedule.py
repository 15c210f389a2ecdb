"""`trnopt evaluate --schedule`: the layout's pipeline schedule, its bubble, and one-line refusals."""

import json

from trnopt.optimizer.commands.cli import main

BASE = ["evaluate", "--target", "trn2", "--model", "llama3-8b", "--tp", "4", "--pp", "2", "--dp", "8",
        "--zero", "1", "--recompute", "full", "--global-batch", "64", "--json", "-"]


def run(capsys, *argv):
    code = main([*BASE, *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_schedule_is_costed_and_written(capsys):
    step = {}
    for argv in ((), ("--interleave", 2), ("--interleave", 2, "--schedule", "ZBVZeroBubble"),
                 ("--interleave", 2, "--schedule", "DualPipeV"), ("--schedule", "GPipe")):
        code, out, _ = run(capsys, *argv)
        doc = json.loads(out)
        assert code == 0, argv
        step[doc["layout"]["schedule"]] = doc["step_breakdown_s"]
    assert set(step) == {"1F1B", "Interleaved1F1B", "ZBVZeroBubble", "DualPipeV", "GPipe"}
    assert step["ZBVZeroBubble"]["pp_bubble"] == 0 < step["DualPipeV"]["pp_bubble"] < step["1F1B"]["pp_bubble"]
    assert step["GPipe"]["pp_bubble"] == step["1F1B"]["pp_bubble"]


def test_schedule_errors_name_the_flag(capsys):
    for argv, rule in ((("--schedule", "ZBV"), "must be one of"),
                       (("--schedule", "ZBVZeroBubble"), "exactly two stages"),
                       (("--schedule", "GPipe", "--interleave", 2), "one stage a rank")):
        code, _, err = run(capsys, *argv)
        assert code == 2 and err.startswith("trnopt: error: --schedule: ") and rule in err, (argv, err)
        assert len(err.strip().splitlines()) == 1


def test_a_framework_that_cannot_run_the_schedule_refuses_it(capsys):
    code, _, err = run(capsys, "--interleave", 2, "--schedule", "ZBVZeroBubble", "--framework", "nxd")
    assert code == 2 and "no ZBVZeroBubble pipeline schedule" in err
    code, _, err = run(capsys, "--interleave", 2, "--schedule", "ZBVZeroBubble", "--zero", 3,
                       "--framework", "torchtitan")
    assert code == 2 and "torch.compile" in err


def test_recompute_defaults_to_what_the_framework_offers(capsys):
    """torchtitan has no attention-only recomputation: under it the default is its per-op checkpointing."""
    base = ["evaluate", "--target", "trn2", "--model", "llama3-8b", "--instances", "1", "--tp", "8", "--zero", "3"]
    main(base + ["--framework", "torchtitan"])
    assert "op recompute" in capsys.readouterr().out
    main(base + ["--zero", "1", "--framework", "nxd"])
    assert "selective recompute" in capsys.readouterr().out
    assert main(base + ["--framework", "torchtitan", "--recompute", "selective"]) == 2
    assert "no 'selective' recomputation" in capsys.readouterr().err
