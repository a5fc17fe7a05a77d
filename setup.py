"""Build hook: a wheel carries the repository's trained models as package data.

The trained models live in ``models/`` at the repository root (tests check the bytes of what is there, so
they are not moved). ``build_py`` copies every model folder (one holding a ``card.json``) and the model
shapes into ``graphmode/bundled_models/`` of the build, where ``graphmode.core.settings`` finds them when no
``models/`` directory is at hand. The datasets under ``models/profiles/`` stay in the repository.
Everything else is configured in pyproject.toml.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
MODELS = ROOT / "models"


def bundled_files() -> list[Path]:
    """The files under ``models/`` a wheel carries: each trained model's folder and ``shapes/*.json``."""
    if not MODELS.is_dir():
        return []
    files: list[Path] = []
    for folder in sorted(p for p in MODELS.iterdir() if p.is_dir() and (p / "card.json").is_file()):
        files += sorted(f for f in folder.iterdir() if f.is_file())
    files += sorted((MODELS / "shapes").glob("*.json"))
    return files


class BuildPyWithModels(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads models/ of the checkout itself
        dest = Path(self.build_lib) / "graphmode" / "bundled_models"
        for src in bundled_files():
            target = dest / src.relative_to(MODELS)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


setup(cmdclass={"build_py": BuildPyWithModels})
