"""`python -m tests.interop.reference_load OUT.json PATH [PATH ...]`: what determined==0.38.1's
`load_trial_from_checkpoint_path(PATH)` (no class argument, full unpickling) gives, as the
first model's weights (or the bare module's, for the pre-0.14 API) and the type's name."""

from __future__ import annotations

import json
import pathlib
import sys

import torch


def main() -> None:
    from determined import pytorch

    out: dict[str, object] = {}
    for path in sys.argv[2:]:
        loaded = pytorch.load_trial_from_checkpoint_path(
            path, torch_load_kwargs={"weights_only": False, "map_location": "cpu"}
        )
        model = loaded if isinstance(loaded, torch.nn.Module) else loaded.context.models[0]
        out[path] = {
            "type": type(loaded).__name__,
            "weights": {k: v.tolist() for k, v in model.state_dict().items()},
        }
    pathlib.Path(sys.argv[1]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
