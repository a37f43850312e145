"""The pieces of the randomised harness `bench/chaos.py`.

`backends` starts a store (single Redis, Sentinel with a replica, a 3-master Cluster with a
replica each) and a broker (that Redis or a RabbitMQ vhost of its own) with workers on it;
`workload` draws a round's trees and writes the script their model answers from; `faults`
draws and injects the faults; `invariants` checks what a round left.
"""
