"""A project's public page: its checked data (collect), the HTML (render), served or
written as static files (serve)."""
