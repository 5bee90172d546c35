"""The machine a run uses: devices and model loading (`models`, with `init_kwargs`, the
user's from_pretrained arguments), LoRA adapters on a model (`lora`), the processes torchrun
starts (`distributed`), and seeding (`seed`).

Every other room may call these; they know nothing of data, rewards or training. Outside
torchrun every `distributed` helper is the identity, so one code path serves both.
"""
