"""The web console: server-rendered pages and a JSON API (/api/v1/) over a proxy's admin API.

It is a client of the AdminService like `popmq admin`, in its own process (`popmq console`) or
beside `popmq serve`. Layout: admin_client (gRPC calls, signed as the user), identity (who is
asking and what they may see), views (the data behind every page, as JSON), api (/api/v1),
pages (HTML), charts (inline SVG), app (the Starlette application), server (uvicorn).
"""
