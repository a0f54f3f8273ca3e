"""The controller lab: open-loop replay of KL traces and a closed-loop simulated plant."""
