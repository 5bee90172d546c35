"""A tool of your own for multi-turn episodes, for the page docs/tools.md:

    rlcli train env=calculator env.tools=[calculator,docs/examples/my_tools.py:unit_price]

The model sees the docstring's first line as the tool's description; what the function returns
is what the model reads back.
"""

PRICES = {"apple": "0.40", "bread": "2.10", "milk": "1.15"}


def unit_price(item):
    """The price in euros of one unit of an item: apple, bread or milk."""
    known = ", ".join(PRICES)
    return PRICES.get(item.strip().lower(), f"unknown item {item.strip()!r}; known: {known}")
