"""No Python op classes for the `chlo` dialect: ops stay generic OpViews (see __init__)."""
