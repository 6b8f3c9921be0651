"""From what the user asked (PlanRequest) to a Plan: planner search, tables, remedies, LR rule, presets."""
