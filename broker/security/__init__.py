"""Security at the broker: who a connection is (its session and principal),
how it proves it (listeners, TLS, SASL), what it may do (ACLs) and how much
(quotas). The network edge (``broker.server``) builds a ``Session`` per
connection and hands it with every request to the request pipeline."""
