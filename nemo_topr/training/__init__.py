"""Training on Megatron-Bridge: the TOPR step, data provider, configs, recipe, scoring, export."""
