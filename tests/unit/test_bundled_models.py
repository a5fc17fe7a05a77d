"""Where the model registry is by default: a source checkout's ``models/``, a user's ``./models``, else the
models a wheel bundles (setup.py copies them into ``graphmode/bundled_models``)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from graphmode.core.settings import _default_models_dir

REPO = Path(__file__).resolve().parents[2]


def _installed_layout(tmp_path: Path, *, bundled: bool) -> Path:
    """A package directory as a wheel installs it: ``<site-packages>/graphmode``, no ``models/`` beside it."""
    package_dir = tmp_path / "venv" / "lib" / "site-packages" / "graphmode"
    package_dir.mkdir(parents=True)
    if bundled:
        (package_dir / "bundled_models" / "some-model").mkdir(parents=True)
    return package_dir


def test_source_checkout_uses_the_repository_models(tmp_path: Path) -> None:
    package_dir = tmp_path / "repo" / "src" / "graphmode"
    package_dir.mkdir(parents=True)
    (tmp_path / "repo" / "models").mkdir()
    assert _default_models_dir(package_dir, cwd=tmp_path) == tmp_path / "repo" / "models"


def test_installed_wheel_run_elsewhere_uses_its_bundled_models(tmp_path: Path) -> None:
    package_dir = _installed_layout(tmp_path, bundled=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _default_models_dir(package_dir, cwd=elsewhere) == package_dir / "bundled_models"


def test_a_local_models_directory_wins_over_the_bundled_one(tmp_path: Path) -> None:
    package_dir = _installed_layout(tmp_path, bundled=True)
    (tmp_path / "work" / "models").mkdir(parents=True)
    assert _default_models_dir(package_dir, cwd=tmp_path / "work") == tmp_path / "work" / "models"


def test_without_bundled_models_the_local_directory_is_named(tmp_path: Path) -> None:
    package_dir = _installed_layout(tmp_path, bundled=False)
    assert _default_models_dir(package_dir, cwd=tmp_path) == tmp_path / "models"


def test_setup_bundles_every_trained_model_and_the_shapes() -> None:
    spec = importlib.util.spec_from_file_location("graphmode_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    setup_py = importlib.util.module_from_spec(spec)
    import setuptools

    real_setup = setuptools.setup
    setuptools.setup = lambda **_: None  # type: ignore[assignment]  # load the module without building
    try:
        spec.loader.exec_module(setup_py)
    finally:
        setuptools.setup = real_setup  # type: ignore[assignment]
    files = {f.relative_to(REPO / "models").as_posix() for f in setup_py.bundled_files()}
    models = [p.name for p in (REPO / "models").iterdir() if (p / "card.json").is_file()]
    assert models, "the repository bundles no trained model"
    for name in models:
        assert {f"{name}/card.json", f"{name}/model.skops"} <= files
    assert any(f.startswith("shapes/") for f in files)
    assert not any(f.startswith("profiles/") for f in files)  # datasets stay in the repository
