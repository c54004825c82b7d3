"""The service's settings, in layers.

One sub-model per concern (``server``, ``model``, ``decoding``, ``engine``, ``limits``,
``reliability``, ``access``, ``cache``, ``documents``, ``observability``), composed into the one
``Settings`` (``settings.py``) that reads ``HYMT_*`` environment variables, a ``.env`` file and
``python -m service`` flags under the same flat names (``HYMT_FAST_PAGE_SIZE``,
``--fast-page-size``). Only the edge (``__main__``, the app factory, the launcher) holds
``Settings``; each layer below gets the config it needs, built from its own sub-model.

This package imports nothing of the layers it configures but for the settings module itself,
so the engine process can read its sub-models without the HTTP side.
"""
