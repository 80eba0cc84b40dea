"""Twisted's endpoint parser for `sandstorm-inherited:` (mcpserver/inherited_socket.py).

This directory is not a package: Twisted finds plugins in every `twisted/plugins` directory on the path, and
`manage.py serve --systemd-socket` puts `mcpserver/twisted_plugins` on the exec'd Daphne's PYTHONPATH.
"""

from mcpserver.inherited_socket import InheritedSocketParser

inherited_socket = InheritedSocketParser()
