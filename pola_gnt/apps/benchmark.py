"""`benchmark`'s library: LLFF at the published protocol, one command, scene by scene.

Every LLFF scene under `data.root` (or those `benchmark.scenes` names) runs in its own folder of the
benchmark's run folder at factor 4 (`images_4/`), every 8th view held out, all test views; each test
view is rendered once, at full resolution, and scored by the standard protocol and by GNT's
(`metrics.extra_protocols=[gnt]`: its every 2nd pixel of the same render, LPIPS-VGG on [0, 1],
unquantised). The scene's run is the project's own: `eval`'s (`apps.evaluation.evaluate`) for
`benchmark.mode=zero_shot`, a training run's (`runs.training.train`: fit, then the same test phase) for
`finetune` (`init_from` the checkpoint, `experiment=finetune`) and `per_scene` (from scratch, the
experiment preset). Each scene's config is composed as `train` / `eval` would compose it from the
benchmark's command line plus the scene's keys (`scene_overrides`).

Then `benchmark.md` and `benchmark.csv`: per scene and mean, ours beside the published figures of the
mode's setting (`evaluation.study.published`), with the marks that make a scene's scores not
comparable (seen in pretraining, a re-processed copy, ...). A scene is done when its `metrics.json`
(written atomically, last) holds both protocols: a stopped benchmark, run again with the same
`hydra.run.dir`, keeps those and goes on (a training scene resumes from its `last.ckpt`); a folder of
another checkpoint or other settings is refused (`benchmark.json`).
"""

from __future__ import annotations

import json
import shlex
import signal
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from pola_gnt.apps.evaluation import evaluate
from pola_gnt.core.errors import RunStopped, UserError
from pola_gnt.core.files import file_sha256, write_atomic
from pola_gnt.data.images import IMAGE_EXTENSIONS, image_folder_name
from pola_gnt.data.scene_loading import data_root
from pola_gnt.evaluation.study.benchmark_table import (
    MISSING,
    PENDING,
    SCORED,
    SKIPPED,
    SceneResult,
    csv_table,
    markdown_table,
)
from pola_gnt.evaluation.study.published import FINE_TUNED, LLFF_SCENES, PER_SCENE, ZERO_SHOT, figures_for
from pola_gnt.runs.checkpoints import (
    CHECKPOINT_DIR,
    PRETRAINED_PREFIX,
    checkpoint_training_scenes,
    read_checkpoint,
    resolve_checkpoint,
    stored_config_dict,
)
from pola_gnt.runs.config.commands import eval_run, training_run
from pola_gnt.runs.config.stored import CONFIG_DIR, command_line_keys
from pola_gnt.runs.guards import Interrupted
from pola_gnt.runs.settings import RunSettings
from pola_gnt.runs.training import train

BENCHMARK_FACTOR = 4  # images_4: what GNT, IBRNet and NeRF scored
BENCHMARK_LLFFHOLD = 8
# nerf_llff_data's photos are 4032x3024 (all 8 scenes): its images_F/ are these divided by F (images_4:
# 1008x756). A scene whose images_F/ has another size is a re-processed copy (other crop, undistortion,
# poses): its scores are not comparable with the published ones.
PUBLISHED_PHOTO_SIZE = (3024, 4032)  # height, width
PROTOCOLS = ("standard", "gnt")  # metrics.protocol, then metrics.extra_protocols
RECORD_FILE = "benchmark.json"
TABLE_FILE, CSV_FILE = "benchmark.md", "benchmark.csv"
METRICS_FILE = "metrics.json"
MODE_SETTINGS = {"zero_shot": ZERO_SHOT, "finetune": FINE_TUNED, "per_scene": PER_SCENE}
# Keys the benchmark sets itself: the scenes are its own, and both protocols are always scored.
OWN_KEYS = ("scene", "metrics.protocol", "metrics.extra_protocols")
# Keys that may differ between a run and its resumption: the scenes chosen, the machine's render keys
# (they change no pixel, docs/interface.md) and how the checkpoint is named (its sha256 is recorded).
RESUMABLE_KEYS = (
    "benchmark.scenes",
    "render.workers",
    "render.chunk_rays",
    "render.max_memory_mb",
    "ckpt_path",
    "init_from",
)


def published_size(factor: int) -> tuple[int, int]:
    """(height, width) of nerf_llff_data's images_F/ (1008x756 at factor 4)."""
    return PUBLISHED_PHOTO_SIZE[0] // factor, PUBLISHED_PHOTO_SIZE[1] // factor


@dataclass
class ScenePlan:
    """A scene folder the benchmark looked for, and whether it can run."""

    name: str
    folder: Path
    status: str  # PENDING (to run) | MISSING | SKIPPED
    reason: str = ""
    size: tuple[int, int] | None = None  # (height, width) of its images_F/
    n_views: int = 0

    def n_test_views(self, llffhold: int) -> int:
        return len(range(0, self.n_views, llffhold))


def find_scenes(root: Path, names: Sequence[str], factor: int) -> list[ScenePlan]:
    """The scene folders `names` under `root`: missing, skipped (no `images_F/`, no poses) with the
    reason, or to run, with their image size and view count."""
    plans = []
    folder_name = image_folder_name(factor)
    for name in names:
        folder = root / name
        if not folder.is_dir():
            plans.append(ScenePlan(name, folder, MISSING, "not on disk"))
            continue
        images = folder / folder_name
        files = (
            sorted(f for f in images.iterdir() if f.suffix.lower() in IMAGE_EXTENSIONS and not f.name.startswith("."))
            if images.is_dir()
            else []
        )
        if not files:
            reason = f"no {folder_name}/" if not images.is_dir() else f"no images in {folder_name}/"
            plans.append(ScenePlan(name, folder, SKIPPED, reason))
            continue
        if not (folder / "poses_bounds.npy").is_file():
            plans.append(ScenePlan(name, folder, SKIPPED, "no poses_bounds.npy"))
            continue
        try:
            with Image.open(files[0]) as image:
                width, height = image.size
        except OSError as err:
            plans.append(ScenePlan(name, folder, SKIPPED, f"{files[0]}: cannot read ({err})"))
            continue
        plans.append(ScenePlan(name, folder, PENDING, size=(height, width), n_views=len(files)))
    return plans


def scene_is_done(folder: Path) -> dict | None:
    """The scene's `metrics.json` when it is complete (both protocols scored), else None."""
    path = folder / METRICS_FILE
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    protocols = document.get("protocols") if isinstance(document, dict) else None
    return document if isinstance(protocols, dict) and all(p in protocols for p in PROTOCOLS) else None


def scene_marks(plan: ScenePlan, document: dict, mode: str, factor: int, llffhold: int) -> dict[str, str]:
    """What makes a scored scene's figures not comparable with the published ones (`MARK_LEGEND`)."""
    marks = {}
    if mode == "zero_shot" and document.get("seen_in_training"):
        marks["seen"] = "in the checkpoint's training scenes: not a zero-shot score"
    init = document.get("init_from") or {}
    if mode == "finetune" and plan.name in (init.get("training_scenes") or []):
        marks["seen"] = "in the pretrained checkpoint's training scenes"
    expected = published_size(factor)
    if plan.size != expected:
        height, width = plan.size or (0, 0)
        marks["re-processed"] = (
            f"{image_folder_name(factor)}/ is {width}x{height}, the published copy {expected[1]}x{expected[0]}: "
            f"another crop and poses, not comparable"
        )
    scored, split = len(document["per_image"]), plan.n_test_views(llffhold)
    if scored < split:
        marks["subset"] = f"{scored} of its {split} test views (data.test_views)"
    if factor != BENCHMARK_FACTOR:
        marks["factor"] = f"factor {factor}: the published figures are at factor {BENCHMARK_FACTOR}"
    if llffhold != BENCHMARK_LLFFHOLD:
        marks["split"] = f"every {llffhold}th view held out, not every {BENCHMARK_LLFFHOLD}th"
    return marks


@contextmanager
def stop_at_once() -> Iterator[None]:
    """SIGTERM / SIGINT stop a zero-shot scene at once (`Interrupted`): nothing of it is kept, the
    finished scenes are (a training scene installs its own handlers, which stop after a step)."""

    def handle(signum, frame) -> None:
        raise Interrupted(signum, immediate=True)

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Benchmark:
    """One benchmark run: its settings, the checkpoint, the scenes, the run folder."""

    def __init__(self, settings: RunSettings, overrides: Sequence[str], run_dir: Path, config_name: str):
        self.settings = settings
        self.mode = self.settings.benchmark.mode
        self.overrides = list(overrides)
        self.run_dir = run_dir
        self.config_name = config_name
        self.groups, self.keys = command_line_keys(self.overrides, CONFIG_DIR)  # what the command line gives
        self._check_keys()
        self.checkpoint = self._checkpoint()
        # The published protocol's factor and split, unless the command line gives others (marked).
        data = self.settings.data
        self.factor = data.factor if self._given("data.factor") else BENCHMARK_FACTOR
        self.llffhold = data.llffhold if self._given("data.llffhold") else BENCHMARK_LLFFHOLD
        self.root = data_root(data)
        names = self.settings.benchmark.scenes or LLFF_SCENES
        self.plans = find_scenes(self.root, names, self.factor)
        if not any(plan.status == PENDING for plan in self.plans):
            found = "; ".join(f"{p.name}: {p.reason}" for p in self.plans)
            raise UserError(f"data.root: {self.root} holds no LLFF scene to benchmark ({found})")

    # ---- what the command line may set --------------------------------------------------------------

    def _given(self, key: str) -> bool:
        return any(k == key or k.startswith(f"{key}.") for k in self.keys) or key in self.groups

    def _check_keys(self) -> None:
        for key in OWN_KEYS:
            if self._given(key):
                why = (
                    "choose the scenes with benchmark.scenes=[fern,room] (folders under data.root)"
                    if key == "scene"
                    else "the benchmark scores every view by both protocols (standard and gnt)"
                )
                raise UserError(f"{key}: set by the benchmark itself; {why}")
        budget = self.settings.benchmark.budget_minutes
        if self.mode == "zero_shot" and budget is not None:
            raise UserError(
                "benchmark.budget_minutes: zero_shot trains nothing; give benchmark.mode=finetune or per_scene"
            )
        if budget is not None and self._given("trainer.max_time"):
            raise UserError("trainer.max_time: give the budget once, as benchmark.budget_minutes")

    def _checkpoint(self) -> dict | None:
        """The checkpoint the scenes start from (`ckpt_path`, or `init_from` when fine-tuning), read
        now: a file that is no checkpoint is one error line before any scene runs."""
        ckpt_path, init_from = self.settings.ckpt_path, self.settings.init_from
        if self.mode == "per_scene":
            for key, value in (("ckpt_path", ckpt_path), ("init_from", init_from)):
                if value:
                    raise UserError(f"{key}: benchmark.mode=per_scene trains each scene from scratch; leave it out")
            return None
        if self.mode == "finetune" and ckpt_path and init_from and ckpt_path != init_from:
            raise UserError("init_from: give the checkpoint to fine-tune once, as ckpt_path (or init_from)")
        spec = (init_from or ckpt_path) if self.mode == "finetune" else ckpt_path
        if self.mode == "zero_shot" and init_from:
            raise UserError("init_from: benchmark.mode=zero_shot scores ckpt_path as it is; give ckpt_path=CKPT")
        key = "init_from" if self.mode == "finetune" and init_from else "ckpt_path"
        path = resolve_checkpoint(spec, self.run_dir, key=key)
        if path is None:
            raise UserError(
                f"ckpt_path: required for benchmark.mode={self.mode}, the checkpoint to "
                f"{'score' if self.mode == 'zero_shot' else 'fine-tune'} (e.g. ckpt_path=pretrained:pola_gnt)"
            )
        checkpoint = read_checkpoint(path)
        return {
            "spec": str(spec),
            # How each scene's run names it: a shipped one by name, a file by its absolute path (`last`
            # and relative paths would resolve elsewhere from the scene's folder).
            "argument": str(spec) if str(spec).startswith(PRETRAINED_PREFIX) else str(path.resolve()),
            "path": str(path.resolve()),
            "sha256": file_sha256(path),
            "model": stored_config_dict(checkpoint, path)["model"]["name"],
            "training_scenes": checkpoint_training_scenes(checkpoint),
        }

    # ---- the record of the run folder ---------------------------------------------------------------

    def identity(self) -> dict:
        """What fixes the scores: a folder holding another benchmark's scenes is refused."""
        kept = sorted(
            o
            for o in self.overrides
            if not any(o.lstrip("+~").startswith(f"{k}=") or o.lstrip("+~").startswith(f"{k}.") for k in RESUMABLE_KEYS)
        )
        checkpoint = None if self.checkpoint is None else {k: self.checkpoint[k] for k in ("sha256", "model")}
        return {"mode": self.mode, "checkpoint": checkpoint, "data_root": str(self.root.resolve()), "overrides": kept}

    def check_record(self) -> None:
        """Write `benchmark.json`, or check that the one there is this benchmark's (a resumption)."""
        path = self.run_dir / RECORD_FILE
        identity = self.identity()
        if path.is_file():
            try:
                stored = json.loads(path.read_text()).get("identity")
            except (OSError, ValueError, AttributeError):
                stored = None
            if stored != identity:
                stored = stored if isinstance(stored, dict) else {}
                differing = sorted(k for k in identity if stored.get(k) != identity[k])
                details = "; ".join(_difference(k, stored.get(k), identity[k]) for k in differing)
                raise UserError(
                    f"hydra.run.dir: {self.run_dir} holds a benchmark of other settings ({details}); "
                    f"give another hydra.run.dir"
                )
            return
        record = {"identity": identity, "command": self.command(), "checkpoint": self.checkpoint}
        write_atomic(path, (json.dumps(record, indent=2) + "\n").encode())

    def command(self) -> str:
        """The command that runs (or resumes) this benchmark."""
        return shlex.join(["python", "-m", "pola_gnt.benchmark", *self.overrides, f"hydra.run.dir={self.run_dir}"])

    # ---- one scene -----------------------------------------------------------------------------------

    def scene_dir(self, plan: ScenePlan) -> Path:
        return self.run_dir / plan.name

    def scene_overrides(self, plan: ScenePlan) -> list[str]:
        """The command line of the scene's run: the benchmark's, the scene and the published protocol's
        keys (those the command line does not give), and for training the mode's recipe."""
        scene_dir = self.scene_dir(plan)
        own = [
            "scene=llff",
            f"scene.path={plan.folder}",
            f"scene.name={plan.name}",
            "metrics.protocol=standard",
            "metrics.extra_protocols=[gnt]",
        ]
        for key, value in (
            ("data.factor", BENCHMARK_FACTOR),
            ("data.llffhold", BENCHMARK_LLFFHOLD),
            ("data.test_views", "null"),
        ):
            if not self._given(key):
                own.append(f"{key}={value}")
        given = [o for o in self.overrides if not o.lstrip("+~").startswith(("ckpt_path=", "init_from="))]
        if self.mode == "zero_shot":
            assert self.checkpoint is not None
            return [*given, f"ckpt_path={self.checkpoint['argument']}", *own]
        resume = (scene_dir / CHECKPOINT_DIR / "last.ckpt").is_file()
        own.append(f"ckpt_path={'last' if resume else 'null'}")
        budget = self.settings.benchmark.budget_minutes
        if budget is not None:
            own.append(f"trainer.max_time={budget:g}")
        if self.mode == "finetune":
            assert self.checkpoint is not None
            own.append(f"init_from={self.checkpoint['argument']}")
            if "experiment" not in self.groups:
                own.append("experiment=finetune")
            if "model" not in self.groups:  # the checkpoint's model, as fine-tuning it needs
                own.append(f"model={self.checkpoint['model']}")
        return [*given, *own]

    def run_scene(self, plan: ScenePlan) -> dict | None:
        """Score the scene (training it first in the training modes); its metrics.json document."""
        overrides = self.scene_overrides(plan)
        scene_dir = self.scene_dir(plan)
        if self.mode == "zero_shot":
            with stop_at_once():
                return evaluate(eval_run(self.config_name, overrides, scene_dir), scene_dir)
        run = training_run(self.config_name, overrides, scene_dir)  # fine-tuning: the checkpoint's network
        print(f"training    {shlex.join(['python', '-m', 'pola_gnt.train', *overrides])}", flush=True)
        with stop_at_once():  # until train() installs its own handlers (they stop after a step)
            return train(run.settings, run.config, scene_dir, run.resume, overrides)

    # ---- the whole run -------------------------------------------------------------------------------

    def results(self) -> list[SceneResult]:
        """Every scene as it stands: scored (its metrics.json and marks), pending, missing or skipped."""
        results = []
        for plan in self.plans:
            document = scene_is_done(self.scene_dir(plan)) if plan.status == PENDING else None
            if document is None:
                results.append(SceneResult(plan.name, plan.status, plan.reason))
                continue
            marks = scene_marks(plan, document, self.mode, self.factor, self.llffhold)
            results.append(SceneResult(plan.name, SCORED, marks=marks, document=document))
        return results

    def write_table(self) -> str:
        figures = figures_for(MODE_SETTINGS[self.mode])
        results = self.results()
        notes = [f"Command: `{self.command()}`"]
        if self.checkpoint is not None:
            notes.append(f"Checkpoint: {self.checkpoint['spec']} (sha256 {self.checkpoint['sha256'][:12]})")
        pending = [r.name for r in results if r.status == PENDING]
        if pending:
            notes.append(f"Not scored yet: {', '.join(pending)} (run the command again to go on).")
        gnt_lpips = [r.name for r in results if r.document is not None and r.scores("gnt")["lpips"] is None]
        if gnt_lpips:
            notes.append(
                "GNT-protocol LPIPS is null: no LPIPS-VGG weights could be found (`$POLA_GNT_LPIPS_WEIGHTS` "
                "with vgg_v0.1.npz, torchvision's cache, or scripts/build_lpips_weights.py)."
            )
        title = f"LLFF benchmark: {MODE_SETTINGS[self.mode]}, factor {self.factor}"
        table = markdown_table(results, figures, title, notes)
        write_atomic(self.run_dir / TABLE_FILE, table.encode())
        write_atomic(self.run_dir / CSV_FILE, csv_table(results, figures).encode())
        return table

    def describe(self) -> None:
        expected = published_size(self.factor)
        print(f"benchmark   {MODE_SETTINGS[self.mode]}, scenes under {self.root}, folder {self.run_dir}", flush=True)
        for plan in self.plans:
            if plan.status == SKIPPED:
                print(
                    f"  {plan.name:<10} skipped: {plan.reason} (the published copy the figures were scored on; "
                    f"`python -m pola_gnt.check_scene scene=llff scene.path={plan.folder} data.factor={self.factor}` "
                    f"builds one from images/, a copy of other pixels)",
                    flush=True,
                )
                continue
            if plan.status == MISSING:
                print(f"  {plan.name:<10} missing: {plan.reason}", flush=True)
                continue
            height, width = plan.size or (0, 0)
            copy = "" if plan.size == expected else f" (re-processed copy: not {expected[1]}x{expected[0]})"
            seen = self.checkpoint is not None and plan.name in self.checkpoint["training_scenes"]
            copy += ", seen: in the checkpoint's training scenes" if seen else ""
            done = " (done)" if scene_is_done(self.scene_dir(plan)) else ""
            print(
                f"  {plan.name:<10} {plan.n_views} views at {width}x{height}{copy}, "
                f"{plan.n_test_views(self.llffhold)} test views{done}",
                flush=True,
            )

    def run(self) -> list[SceneResult]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.check_record()
        self.describe()
        todo = [p for p in self.plans if p.status == PENDING]
        for number, plan in enumerate(todo, start=1):
            if scene_is_done(self.scene_dir(plan)):
                print(f"[{number}/{len(todo)}] {plan.name}: done, kept from an earlier run", flush=True)
                continue
            print(f"[{number}/{len(todo)}] {plan.name}", flush=True)
            try:
                self.run_scene(plan)
            except Interrupted as err:
                raise self._stopped(err.signum, plan, number - 1, len(todo)) from None
            except RunStopped as err:
                if err.prefix == "stopped":  # a training scene stopped by a signal, its last.ckpt saved
                    raise self._stopped(err.exit_code - 128, plan, number - 1, len(todo)) from None
                raise RunStopped(f"{plan.name}: {err}", err.exit_code, err.prefix) from None
            self.write_table()
        table = self.write_table()
        print(table, flush=True)
        print(f"wrote {self.run_dir / TABLE_FILE}, {CSV_FILE} and each scene's {METRICS_FILE}", flush=True)
        return self.results()

    def _stopped(self, signum: int, plan: ScenePlan, done: int, total: int) -> RunStopped:
        return RunStopped(
            f"{signal.Signals(signum).name} during {plan.name}; {done} of {total} scenes done, kept in "
            f"{self.run_dir} (a training scene resumes from its last.ckpt); resume with: {self.command()}",
            128 + signum,
            prefix="stopped",
        )


def _difference(key: str, there, now) -> str:
    """One item of a record that differs: the command-line keys added and dropped, or both values."""
    if key == "overrides" and isinstance(there, list):
        added, dropped = sorted(set(now) - set(there)), sorted(set(there) - set(now))
        return f"command line: {', '.join([*(f'+{o}' for o in added), *(f'-{o}' for o in dropped)])}"
    return f"{key}: {there!r} there, {now!r} now"


def run_benchmark(
    settings: RunSettings, overrides: Sequence[str], run_dir: Path, config_name: str
) -> list[SceneResult]:
    """The benchmark of the command line's settings (`overrides`: what was typed, from which each
    scene's command line is made; `config_name`: the config file it was composed from) in `run_dir`."""
    return Benchmark(settings, overrides, run_dir, config_name).run()
