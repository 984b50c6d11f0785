"""The resolved pair: the env file (config), the recipe, the per-rank ``docker run`` argv
(plan) and the one frozen object every command is handed (resolved)."""
