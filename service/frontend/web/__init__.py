"""The web page for people: ``GET /`` and its static files, served by the service itself (no
build step). The page uses the public API only: ``/languages``, ``/translate/stream`` and the
DeepL document API, with the API key the person enters."""
