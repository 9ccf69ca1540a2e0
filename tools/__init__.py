"""What builds the project's artifacts, outside the product: used by ``make release``
(``tools/release.py``) and by the suite, which builds the same image to run on its real nodes.
``release`` and ``image`` use the standard library only, so that the release workflow runs them on
a bare runner's Python."""
