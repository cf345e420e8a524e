"""The runner protocol: the contract the bot, the CLI and agents share with the runner.

Both sides import it and it imports neither (bot → protocol ← runner): the messages and what each
request may be sent by and how it is audited (messages.py), what a line may hold (wire.py), version
negotiation (versions.py), the asyncio client (client.py) and the standard-library one the hot
agent verbs use (quick_client.py), and the budget and fetch specs requests carry (budget.py,
fetch_spec.py). Nothing is imported here: a quick agent verb loads quick_client alone.
"""
