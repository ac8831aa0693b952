"""The one place that reads the raw config (Hydra's `DictConfig`); everything below the entry points
takes the typed settings it builds (`pola_gnt.runs.settings` and the sections defined beside their
consumers).

- `schema`: the settings classes as Hydra's schema (ConfigStore), and the reader that turns a config
  into them, each value checked against its field and its class's `check`.
- `read`: the composed config -> `RunSettings` / `ProcessDataSettings`; `check_scene`.
- `app`: the Hydra entry-point wrapper (`@entry_point`), the `${folder_name:...}` resolver, the
  device line, the run-folder check.
- `stored`: the run config stored in a checkpoint, and that config with the command line's keys
  applied (eval, render_video, analyze).
- `commands`: the config of a command run from inside another (the benchmark's `eval` and `train` of
  each scene), composed as that command composes it.
"""

from pola_gnt.runs.config.read import (
    check_scene,
    read_process_data_settings,
    read_run_settings,
)

__all__ = ["check_scene", "read_process_data_settings", "read_run_settings"]
