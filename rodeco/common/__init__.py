"""What the engines and every layer above them share: plain data (``state``), the parts' protocols, the budget's and
working memory's arithmetic, sampling, ranking and winner rules, hook specifications, value checks and the machine's
answers to device questions."""
