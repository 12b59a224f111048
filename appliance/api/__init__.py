"""The management API on port 8080 and the status page: app.py builds the aiohttp app from `ApiPorts`
(ports.py), the node's narrow handles; auth.py, signing.py and admin_credential.py decide who may use it;
listener.py bounds connections; reads.py, metrics.py, status_page.py, decisions.py and secret_rotation.py
are its routes. The group file's [management] table is appliance/management_settings.py, which config.py
reads. Nothing here imports the node."""
