"""nvrx_eks.resources in the checkout: the editable install maps nvrx_eks.templates onto templates/."""

from __future__ import annotations

from nvrx_eks import resources
from tests.support import REPO_ROOT


def test_templates_resolve_to_the_checkouts_templates_folder():
    """Editing templates/ changes what `nvrx-eks render` reads, without reinstalling."""
    assert resources.templates_dir() == REPO_ROOT / "templates"
    assert (resources.templates_dir() / "scripts" / "trainer-entrypoint.sh.j2").is_file()
