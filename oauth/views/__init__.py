"""OAuth views, split by protocol concern: consent (authorization endpoint), registration (RFC 7591/7592),
rotation (the admin's kill switch), and the console's pages that regenerate, suspend and resume a credential.
Token, revocation and metadata endpoints are the toolkit's own."""
