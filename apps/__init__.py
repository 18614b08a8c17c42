"""The apps NeuroFed ships as package data (no Python here): ``web/`` (the browser pages, with the onnxruntime-web
files they load) and ``node/`` (the Node scripts). ``neurofed app serve`` serves ``web/`` from the installed
package; :func:`neurofed.export.apps.packaged_web` and :func:`neurofed.export.apps.packaged_node` find them."""
