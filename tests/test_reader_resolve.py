"""reader: index spans and call resolution on small synthetic packages, and the chains on minisgl itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from reader.chains import PACKAGE_DIR, build_chain
from reader.index import build_index
from reader.resolve import Resolver

ROOT = Path(__file__).resolve().parent.parent


def make_pkg(tmp_path: Path, files: dict[str, str]) -> Resolver:
    pkg = tmp_path / "pkg"
    for name, src in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(src))
    return Resolver(build_index(pkg))


def edges(r: Resolver, qname: str) -> list[tuple[str, str | None]]:
    return [(c.kind, c.target) for c in r.resolve(qname).calls]


def test_spans_include_decorators_and_leading_comments(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "m.py": """\
            import functools


            # a comment about f
            # on two lines
            @functools.cache
            def f():
                return 1


            class C:
                def g(self):
                    pass
            """
        },
    )
    f, g = r.index.functions["pkg.m.f"], r.index.functions["pkg.m.C.g"]
    assert (f.start, f.end) == (4, 8)
    assert (g.start, g.end) == (12, 13)
    assert r.index.classes["pkg.m.C"].methods == {"g": "pkg.m.C.g"}


def test_self_attributes_annotations_and_aliased_imports(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "a.py": """\
            class Engine:
                def run(self) -> "Result":
                    return Result()

            class Result:
                def show(self):
                    pass

            def helper():
                pass
            """,
            "b.py": """\
            from __future__ import annotations
            import pkg.a as pa
            from pkg.a import Engine as E, helper as h

            class Owner:
                engine2: E

                def __init__(self):
                    self.engine = E()

                def go(self, other: pa.Engine):
                    self.engine.run()
                    self.engine2.run()
                    other.run().show()
                    h()
                    pa.helper()
                    res = self.engine.run()
                    res.show()
            """,
        },
    )
    assert edges(r, "pkg.b.Owner.go") == [
        ("internal", "pkg.a.Engine.run"),
        ("internal", "pkg.a.Engine.run"),
        ("internal", "pkg.a.Engine.run"),
        ("internal", "pkg.a.Result.show"),
        ("internal", "pkg.a.helper"),
        ("internal", "pkg.a.helper"),
        ("internal", "pkg.a.Engine.run"),
        ("internal", "pkg.a.Result.show"),
    ]
    assert edges(r, "pkg.b.Owner.__init__") == [("internal", "pkg.a.Engine")]  # class without __init__


def test_inheritance_mro_classmethod_and_super(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "m.py": """\
            class Base:
                def __init__(self):
                    pass

                def shared(self):
                    pass

                @classmethod
                def make(cls) -> "Base":
                    return cls()

            class Mid(Base):
                pass

            class Leaf(Mid):
                def __init__(self):
                    super().__init__()
                    self.shared()

            def use():
                b = Leaf.make()
                b.shared()
                Leaf()
            """
        },
    )
    assert edges(r, "pkg.m.Leaf.__init__") == [
        ("external", "builtins.super"),
        ("internal", "pkg.m.Base.__init__"),
        ("internal", "pkg.m.Base.shared"),
    ]
    assert edges(r, "pkg.m.use") == [
        ("internal", "pkg.m.Base.make"),
        ("internal", "pkg.m.Base.shared"),
        ("internal", "pkg.m.Leaf.__init__"),
    ]


def test_module_call_goes_to_forward_and_externals_are_separate(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "m.py": """\
            import torch
            import torch.nn.functional as F
            from torch import nn

            class Linear(nn.Module):
                def forward(self, x: torch.Tensor) -> torch.Tensor:
                    return F.linear(x, self.weight)

            class Block(nn.Module):
                layer_cls = Linear

                def __init__(self):
                    super().__init__()
                    self.proj = Linear()
                    self.layers = nn.ModuleList(self.layer_cls() for _ in range(2))

                def forward(self, x):
                    y = self.proj(x).relu()
                    for layer in self.layers:
                        y = layer(y)
                    return torch.cat([y, y])
            """
        },
    )
    assert edges(r, "pkg.m.Block.forward") == [
        ("internal", "pkg.m.Linear.forward"),
        ("external", "torch.Tensor.relu"),
        ("internal", "pkg.m.Linear.forward"),
        ("external", "torch.cat"),
    ]
    assert edges(r, "pkg.m.Linear.forward") == [("external", "torch.nn.functional.linear")]
    init_calls = edges(r, "pkg.m.Block.__init__")
    assert ("external", "torch.nn.Module.__init__") in init_calls
    assert ("internal", "pkg.m.Linear") in init_calls


def test_unresolvable_calls_are_listed_not_guessed(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "m.py": """\
            class A:
                def run(self):
                    pass

            def f(x, cb):
                x.run()
                cb()
                make_something().run()
            """
        },
    )
    calls = r.resolve("pkg.m.f").calls
    assert [c.kind for c in calls] == ["unresolved", "unresolved", "unresolved", "unresolved"]
    assert [c.text for c in calls] == ["x.run()", "cb()", "make_something()", "make_something().run()"]
    assert [c.line for c in calls] == [6, 7, 8, 8]


def test_unannotated_params_take_the_type_every_call_site_passes(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "m.py": """\
            class Runner:
                def step(self):
                    pass

            def load():
                return Runner(), "tok"

            def once(runner):
                runner.step()

            def main():
                runner, tok = load()
                once(runner)
            """
        },
    )
    assert edges(r, "pkg.m.once") == [("internal", "pkg.m.Runner.step")]


def test_abstract_method_lists_concrete_overrides_as_dispatch(tmp_path):
    r = make_pkg(
        tmp_path,
        {
            "m.py": """\
            from abc import ABC, abstractmethod
            from dataclasses import dataclass

            class Backend(ABC):
                @abstractmethod
                def run(self, x): ...

            class Native(Backend):
                def run(self, x):
                    pass

            @dataclass
            class Batch:
                backend: "Backend"

            def go(batch: Batch):
                batch.backend.run(1)
            """
        },
    )
    (call,) = r.resolve("pkg.m.go").calls
    assert (call.kind, call.target, call.dispatch) == ("internal", "pkg.m.Backend.run", ["pkg.m.Native.run"])


# -- minisgl itself --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def latency():
    return build_chain("latency")


def _preorder(chain) -> list[str]:
    return [n.qname.removeprefix("minisgl.") for n in chain.root.walk()]


def _in_order(seq: list[str], wanted: list[str]) -> bool:
    it = iter(seq)
    return all(any(x == w for x in it) for w in wanted)


def test_latency_chain_order(latency):
    names = _preorder(latency)
    assert _in_order(
        names,
        [
            "bench_one_batch.latency_test",
            "bench_one_batch.load_model",
            "bench_one_batch.latency_test_run_once",
            "bench_one_batch._TorchBenchRunner.extend",
            "bench_one_batch.extend",
            "managers.schedule_batch.ScheduleBatch.init_new",
            "managers.schedule_batch.ScheduleBatch.prepare_for_extend",
            "model_executor.forward_batch_info.ForwardBatch.init_new",
            "model_executor.model_runner.ModelRunner.forward",
            "models.llama.LlamaForCausalLM.forward",
            "models.llama.LlamaModel.forward",
            "models.llama.LlamaDecoderLayer.forward",
            "models.llama.LlamaAttention.forward",
            "layers.radix_attention.RadixAttention.forward",
            "layers.attention.base_attn_backend.AttentionBackend.forward",
            "layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend",
            "model_executor.model_runner.ModelRunner.sample",
            "layers.sampler.Sampler.forward",
        ],
    ), names
    # a CUDA graph capture runs the model's forward at load: cut there, so it is expanded under the extend
    (capture,) = [n for n in latency.root.walk() if n.qname.endswith("DecodeCudaGraphRunner.capture_one_shape")]
    deferred = [c for c in capture.children if c.qname == "minisgl.models.llama.LlamaForCausalLM.forward"]
    assert [(c.marker, c.children) for c in deferred] == [("deferred", [])]
    dispatch = [n for n in latency.root.walk() if n.via == "dispatch"]
    # CPUGraphRunner.prepare_replay reaches the backend through ForwardBatch.attn_backend, typed as the base class;
    # ModelRunner.forward reaches its graph runner (CPUGraphRunner or DecodeCudaGraphRunner) through BaseRunner.
    assert {n.qname.rsplit(".", 1)[-1] for n in dispatch} == {
        "forward_extend",
        "forward_decode",
        "init_forward_metadata_out_graph",
        "can_run_graph",
        "execute",
    }


def test_latency_chain_spans_match_source(latency):
    for node in latency.root.walk():
        lines = node.file.read_text().splitlines()
        name = node.qname.rsplit(".", 1)[-1]
        body = "\n".join(lines[node.start - 1 : node.end])
        assert f"def {name}(" in body or f"class {name}" in body, node.qname
        first = lines[node.start - 1].strip()
        assert first.startswith(("def ", "class ", "@", "#")), (node.qname, first)
        if node.end < len(lines):  # the line after the span is not part of the piece's body
            nxt = lines[node.end]
            assert not nxt.strip() or len(nxt) - len(nxt.lstrip()) <= len(first) - len(first.lstrip()) + 4
    extend = next(n for n in latency.root.walk() if n.qname == "minisgl.bench_one_batch.extend")
    src = PACKAGE_DIR.joinpath("bench_one_batch.py").read_text().splitlines()
    assert src[extend.start - 1] == "@torch.no_grad()" and src[extend.start].startswith("def extend(")


def test_profile_and_correctness_chains():
    profile = build_chain("profile")
    names = _preorder(profile)
    assert names[:2] == ["bench_one_batch.latency_test", "bench_one_batch.latency_test_run_once"]
    assert "utils.profile_utils.start_profile" in names and "utils.profile_utils.stop_profile" in names
    correctness = _preorder(build_chain("correctness"))
    assert _in_order(
        correctness, ["bench_one_batch.correctness_test", "bench_one_batch.extend", "bench_one_batch.decode"]
    )
    with pytest.raises(KeyError):
        build_chain("nope")


def test_cli_bad_chain_name_is_one_line_error():
    proc = subprocess.run(
        [sys.executable, "-m", "reader", "chain", "nope"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown chain 'nope'") and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
