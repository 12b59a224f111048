"""The management API on port 8080 and the status page: app.py builds the aiohttp app from `ApiPorts`
(ports.py), the node's narrow handles; auth.py, signing.py and admin_credential.py decide who may use it;
listener.py bounds connections; reads.py, metrics.py, status_page.py, decisions.py and secret_rotation.py
are its routes; settings.py is the group file's [management] table. Nothing here imports the node."""
