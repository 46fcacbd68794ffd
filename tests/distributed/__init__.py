"""Controller and agents over real gRPC (issue 3): placement independence, causality, failures."""
