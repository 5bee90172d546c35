"""Scoring responses: rule rewards (`rules`), reward and process-reward models (`models`),
what reward.components and reward.function name, and their checks (`components`), the
`Scorer` that combines the components and user functions (`scorer`), the two conventions a
user's function is called in, rlcli's and TRL's (`conventions`), the worker process that runs
it (`worker`), and `sampling`, where a sampler and a scorer meet: sample a group per problem
and score it.
"""
