"""The HTTP layer: one blueprint per surface, auth, error handling, access logs; wired by
`app.create_app`. Nothing outside the HTTP layer imports it."""
