"""Scoring responses: rule rewards (`rules`), reward and process-reward models (`models`),
the `Scorer` that combines the configured components and user functions (`scorer`), the
worker process that runs a user's function (`worker`), and `sampling`, where a sampler and a
scorer meet: sample a group per problem and score it.
"""
